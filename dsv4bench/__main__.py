from dsv4bench.cli import main

main()
