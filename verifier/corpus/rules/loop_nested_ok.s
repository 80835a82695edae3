# two nested loops of 10
#@ type kprobe
#@ intent accept
mov %r0, 0
mov %r1, 0
outer:
mov %r2, 0
inner:
add %r0, 1
add %r2, 1
jlt %r2, 10, inner
add %r1, 1
jlt %r1, 10, outer
exit
