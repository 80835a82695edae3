# delete with a key of the map's key size
#@ type kprobe
#@ intent accept
#@ map h hash 8 8 16
stdw [%r10-8], 1
ldmap %r1, h
mov %r2, %r10
add %r2, -8
call 3
mov %r0, 0
exit
