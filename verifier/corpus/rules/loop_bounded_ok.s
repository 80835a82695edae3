# a loop of 100 iterations
#@ type kprobe
#@ intent accept
mov %r0, 0
mov %r1, 0
loop:
add %r0, 2
add %r1, 1
jlt %r1, 100, loop
exit
