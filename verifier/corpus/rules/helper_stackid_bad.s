# get_stackid into a hash map
#@ type kprobe
#@ intent reject
#@ map h hash 4 8 16
ldmap %r2, h
mov %r3, 0
call 27
mov %r0, 0
exit
