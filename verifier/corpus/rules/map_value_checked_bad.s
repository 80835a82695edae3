# an index checked against the wrong bound
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
jgt %r6, 16, out
add %r0, %r6
ldxb %r0, [%r0]
exit
out:
mov %r0, 0
exit
