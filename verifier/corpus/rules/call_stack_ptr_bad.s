# the callee writes past the caller's frame through that pointer
#@ type kprobe
#@ intent reject
stdw [%r10-8], 0
mov %r1, %r10
add %r1, -8
call local f
ldxdw %r0, [%r10-8]
exit
f:
stdw [%r1+8], 42
mov %r0, 0
exit
