# an unchecked value pointer passed as an update value
#@ type kprobe
#@ intent reject
#@ map h hash 4 8 16
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, h
call 1
mov %r3, %r0
ldmap %r1, h
mov %r2, %r10
add %r2, -4
mov %r4, 0
call 2
mov %r0, 0
exit
