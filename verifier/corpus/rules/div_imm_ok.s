# division by a non-zero constant
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+8]
div %r0, 3
exit
