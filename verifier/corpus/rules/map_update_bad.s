# the 16-byte value would be read from past the frame
#@ type kprobe
#@ intent reject
#@ map arr array 4 16 4
stw [%r10-4], 0
stdw [%r10-16], 2
ldmap %r1, arr
mov %r2, %r10
add %r2, -4
mov %r3, %r10
add %r3, -8
mov %r4, 0
call 2
mov %r0, 0
exit
