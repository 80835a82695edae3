# a stack pointer moved past the frame by a bounded amount
#@ type kprobe
#@ intent reject
stdw [%r10-8], 0
ldxdw %r2, [%r1+8]
and %r2, 8
mov %r3, %r10
add %r3, -8
add %r3, %r2
ldxdw %r0, [%r3]
exit
