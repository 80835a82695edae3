# the callback writes past the 8 bytes it was pointed at
#@ type kprobe
#@ intent reject
stdw [%r10-8], 0
mov %r1, 4
ldfunc %r2, 7
mov %r3, %r10
add %r3, -8
mov %r4, 0
call 181
ldxdw %r0, [%r10-8]
exit
stdw [%r2+8], 1
mov %r0, 0
exit
