# a raw tracepoint program reading its twelfth argument, and half of its first
#@ type raw_tracepoint
#@ intent accept
ldxdw %r0, [%r1+88]
ldxw %r2, [%r1+0]
exit
