# arithmetic on a pointer that may be null
#@ type kprobe
#@ intent reject
#@ map h hash 4 16 4
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, h
call 1
add %r0, 8
jeq %r0, 0, out
ldxdw %r0, [%r0]
exit
out:
mov %r0, 0
exit
