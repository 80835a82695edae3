# a tracepoint program reading an argument a byte at a time
#@ type tracepoint
#@ intent accept
ldxb %r0, [%r1+17]
exit
