# the caller dereferences what the callee returned: a dead frame's address
#@ type kprobe
#@ intent reject
call local f
ldxdw %r0, [%r0]
exit
f:
stdw [%r10-8], 3
mov %r0, %r10
add %r0, -8
exit
