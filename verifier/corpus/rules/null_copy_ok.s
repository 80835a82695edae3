# checking one copy of the result makes the other copy safe too
#@ type kprobe
#@ intent accept
#@ map h hash 4 8 16
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, h
call 1
mov %r6, %r0
jeq %r0, 0, out
ldxdw %r0, [%r6]
exit
out:
mov %r0, 0
exit
