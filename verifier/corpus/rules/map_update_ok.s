# update with a 16-byte value from the stack
#@ type kprobe
#@ intent accept
#@ map arr array 4 16 4
stw [%r10-4], 0
stdw [%r10-24], 1
stdw [%r10-16], 2
ldmap %r1, arr
mov %r2, %r10
add %r2, -4
mov %r3, %r10
add %r3, -24
mov %r4, 0
call 2
mov %r0, 0
exit
