# a map value pointer stored half-way into another map value is not a pointer again
#@ type kprobe
#@ intent reject
#@ map arr array 4 8 4
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, arr
call 1
jeq %r0, 0, out
stxdw [%r0], %r10
ldxdw %r1, [%r0]
stdw [%r1-8], 0
out:
mov %r0, 0
exit
