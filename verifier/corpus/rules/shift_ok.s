# the widest valid shift
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+8]
lsh %r0, 63
exit
