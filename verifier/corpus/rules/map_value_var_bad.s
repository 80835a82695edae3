# a masked index up to 24, then an 8-byte read of a 16-byte value
#@ type kprobe
#@ intent reject
#@ map arr array 4 16 4
ldxdw %r6, [%r1+8]
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, arr
call 1
jeq %r0, 0, out
and %r6, 3
lsh %r6, 3
add %r0, %r6
ldxdw %r0, [%r0]
exit
out:
mov %r0, 0
exit
