# adding a constant to a stack pointer
#@ type kprobe
#@ intent accept
stdw [%r10-16], 1
mov %r1, %r10
add %r1, -16
ldxdw %r0, [%r1]
exit
