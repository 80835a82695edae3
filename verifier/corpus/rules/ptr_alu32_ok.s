# 32-bit arithmetic on a scalar
#@ type kprobe
#@ intent accept
ldxdw %r2, [%r1+8]
add32 %r2, 4
mov %r0, %r2
exit
