# push an 8-byte value to a queue
#@ type kprobe
#@ intent accept
#@ map q queue 0 8 16
stdw [%r10-8], 1
ldmap %r1, q
mov %r2, %r10
add %r2, -8
mov %r3, 0
call 87
mov %r0, 0
exit
