# a checked pointer spilled and filled stays checked
#@ type kprobe
#@ intent accept
#@ map h hash 4 8 16
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, h
call 1
jeq %r0, 0, out
stxdw [%r10-16], %r0
ldxdw %r1, [%r10-16]
ldxdw %r0, [%r1]
exit
out:
mov %r0, 0
exit
