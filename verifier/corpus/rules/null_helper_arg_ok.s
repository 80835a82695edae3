# a checked value pointer passed as an update value
#@ type kprobe
#@ intent accept
#@ map h hash 4 8 16
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, h
call 1
jeq %r0, 0, out
mov %r3, %r0
ldmap %r1, h
mov %r2, %r10
add %r2, -4
mov %r4, 0
call 2
out:
mov %r0, 0
exit
