# a loop that counts to 4
#@ type kprobe
#@ intent accept
mov %r0, 0
loop:
add %r0, 1
jlt %r0, 4, loop
exit
