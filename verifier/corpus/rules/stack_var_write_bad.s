# the variable offset may reach past the frame
#@ type kprobe
#@ intent reject
stdw [%r10-16], 0
stdw [%r10-8], 0
ldxdw %r2, [%r1+8]
and %r2, 31
mov %r3, %r10
add %r3, -16
add %r3, %r2
stb [%r3], 1
mov %r0, 0
exit
