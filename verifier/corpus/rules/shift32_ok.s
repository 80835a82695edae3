# the widest valid 32-bit shift
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+8]
rsh32 %r0, 31
exit
