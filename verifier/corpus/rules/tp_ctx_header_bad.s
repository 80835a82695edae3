# a tracepoint program reading the record's common_* fields, which the kernel refuses
#@ type tracepoint
#@ intent reject
ldxw %r0, [%r1+4]
exit
