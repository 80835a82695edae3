# read the last 8 bytes of a 16-byte array value
#@ type kprobe
#@ intent accept
#@ map arr array 4 16 4
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, arr
call 1
jeq %r0, 0, out
ldxdw %r0, [%r0+8]
exit
out:
mov %r0, 0
exit
