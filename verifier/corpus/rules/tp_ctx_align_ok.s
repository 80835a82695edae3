# a tracepoint program reading far into a record, aligned
#@ type tracepoint
#@ intent accept
ldxdw %r0, [%r1+2040]
exit
