# an unbounded index into the stack
#@ type kprobe
#@ intent reject
stdw [%r10-8], 0
ldxdw %r2, [%r1+8]
mov %r3, %r10
add %r3, -8
add %r3, %r2
ldxb %r0, [%r3]
exit
