# a stack pointer passed where a helper takes a map
#@ type kprobe
#@ intent reject
stw [%r10-4], 0
mov %r1, %r10
mov %r2, %r10
add %r2, -4
call 1
mov %r0, 0
exit
