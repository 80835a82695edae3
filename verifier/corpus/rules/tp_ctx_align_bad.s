# a tracepoint program reading 4 bytes at an offset that is not a multiple of 4
#@ type tracepoint
#@ intent reject
ldxw %r0, [%r1+10]
exit
