# modulo by a non-zero constant
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+8]
mod %r0, 10
exit
