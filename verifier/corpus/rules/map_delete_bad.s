# delete with a scalar as the key pointer
#@ type kprobe
#@ intent reject
#@ map h hash 8 8 16
ldmap %r1, h
mov %r2, 8
call 3
mov %r0, 0
exit
