# a negative offset into a map value
#@ type kprobe
#@ intent reject
#@ map arr array 4 16 4
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, arr
call 1
jeq %r0, 0, out
ldxw %r0, [%r0-4]
exit
out:
mov %r0, 0
exit
