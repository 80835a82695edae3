# an 8-byte key read from 4 bytes below the frame pointer
#@ type kprobe
#@ intent reject
#@ map h hash 8 8 16
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, h
call 1
mov %r0, 0
exit
