# the inner loop resets the outer counter
#@ type kprobe
#@ intent reject
mov %r0, 0
mov %r1, 0
outer:
mov %r2, 0
inner:
add %r0, 1
add %r2, 1
mov %r1, 0
jlt %r2, 10, inner
add %r1, 1
jlt %r1, 10, outer
exit
