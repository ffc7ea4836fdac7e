from launcher.entry import main

main()
