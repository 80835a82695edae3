# lookup gets the context as the key
#@ type kprobe
#@ intent reject
#@ map h hash 4 8 16
mov %r2, %r1
ldmap %r1, h
call 1
mov %r0, 0
exit
