# a tail call through a program array
#@ type kprobe
#@ intent accept
#@ map progs prog_array 4 4 4
ldmap %r2, progs
mov %r3, 0
call 12
mov %r0, 0
exit
