# a bounded index selects between two fixed loads
#@ type kprobe
#@ intent accept
ldxdw %r2, [%r1+8]
and %r2, 1
jeq %r2, 0, zero
ldxdw %r0, [%r1+16]
exit
zero:
ldxdw %r0, [%r1+8]
exit
