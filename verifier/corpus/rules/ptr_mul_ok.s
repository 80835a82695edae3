# multiplying a scalar loaded from the context
#@ type kprobe
#@ intent accept
ldxdw %r2, [%r1+8]
mul %r2, 3
mov %r0, %r2
exit
