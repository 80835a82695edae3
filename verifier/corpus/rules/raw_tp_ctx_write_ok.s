# a raw tracepoint program reading two bytes of its first argument
#@ type raw_tracepoint
#@ intent accept
ldxh %r0, [%r1+2]
exit
