# a 4-byte fetch-and-add on a stack slot holding a spilled pointer
#@ type kprobe
#@ intent reject
stxdw [%r10-8], %r1
mov %r2, 1
lock fetch add32 [%r10-8], %r2
mov %r0, %r2
exit
