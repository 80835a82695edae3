# arithmetic after the check
#@ type kprobe
#@ intent accept
#@ map h hash 4 16 4
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, h
call 1
jeq %r0, 0, out
add %r0, 8
ldxdw %r0, [%r0]
exit
out:
mov %r0, 0
exit
