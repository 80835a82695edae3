# an array lookup with a constant key out of range may miss
#@ type kprobe
#@ intent reject
#@ map arr array 4 16 4
stw [%r10-8], 4
mov %r2, %r10
add %r2, -8
ldmap %r1, arr
call 1
ldxdw %r0, [%r0]
exit
