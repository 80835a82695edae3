# 32-bit division by a constant
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+8]
div32 %r0, 7
exit
