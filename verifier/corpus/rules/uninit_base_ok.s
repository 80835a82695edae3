# the base register of a load is the context
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+8]
exit
