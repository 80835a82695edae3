# a lookup result used without a check
#@ type kprobe
#@ intent reject
#@ map h hash 4 8 16
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, h
call 1
ldxdw %r0, [%r0]
exit
