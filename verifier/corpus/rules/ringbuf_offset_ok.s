# submit the record's start after writing through a moved copy
#@ type kprobe
#@ intent accept
#@ map rb ringbuf 0 0 4096
ldmap %r1, rb
mov %r2, 16
mov %r3, 0
call 131
jeq %r0, 0, out
mov %r1, %r0
add %r1, 8
stdw [%r1], 1
mov %r1, %r0
mov %r2, 0
call 132
out:
mov %r0, 0
exit
