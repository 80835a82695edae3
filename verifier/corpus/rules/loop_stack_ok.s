# a loop filling 8 stack slots
#@ type kprobe
#@ intent accept
mov %r1, %r10
add %r1, -64
mov %r2, 0
loop:
stdw [%r1], 0
add %r1, 8
add %r2, 1
jlt %r2, 8, loop
mov %r0, 0
exit
