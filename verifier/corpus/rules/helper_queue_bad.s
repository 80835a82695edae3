# push to a hash map
#@ type kprobe
#@ intent reject
#@ map h hash 4 8 16
stdw [%r10-8], 1
ldmap %r1, h
mov %r2, %r10
add %r2, -8
mov %r3, 0
call 87
mov %r0, 0
exit
