# an 8-byte hash key on the stack
#@ type kprobe
#@ intent accept
#@ map h hash 8 8 16
stdw [%r10-8], 0
mov %r2, %r10
add %r2, -8
ldmap %r1, h
call 1
mov %r0, 0
exit
