# the callee writes through a pointer into the caller's stack
#@ type kprobe
#@ intent accept
stdw [%r10-8], 0
mov %r1, %r10
add %r1, -8
call local f
ldxdw %r0, [%r10-8]
exit
f:
stdw [%r1], 42
mov %r0, 0
exit
