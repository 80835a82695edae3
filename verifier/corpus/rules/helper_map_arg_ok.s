# lookup gets a map in r1
#@ type kprobe
#@ intent accept
#@ map h hash 4 8 16
stw [%r10-4], 0
ldmap %r1, h
mov %r2, %r10
add %r2, -4
call 1
mov %r0, 0
exit
