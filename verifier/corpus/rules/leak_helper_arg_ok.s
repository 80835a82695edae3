# a pointer passed where a helper takes any value
#@ type kprobe
#@ intent accept
stw [%r10-8], 0x000a7025
mov %r1, %r10
add %r1, -8
mov %r2, 4
mov %r3, %r10
call 6
mov %r0, 0
exit
