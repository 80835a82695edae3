# a loop filling 9 slots of a 64-byte area runs off the frame
#@ type kprobe
#@ intent reject
mov %r1, %r10
add %r1, -64
mov %r2, 0
loop:
stdw [%r1], 0
add %r1, 8
add %r2, 1
jlt %r2, 9, loop
mov %r0, 0
exit
