# a stack pointer moved by a bounded amount stays inside
#@ type kprobe
#@ intent accept
stdw [%r10-64], 0
stdw [%r10-56], 0
ldxdw %r2, [%r1+8]
and %r2, 8
mov %r3, %r10
add %r3, -64
add %r3, %r2
ldxdw %r0, [%r3]
exit
